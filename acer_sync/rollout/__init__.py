"""Acting in envs: the Actor (one step of the policy), the Runner (one segment of N envs), evaluation."""
