"""The networks: torsos, memory and heads (``networks``), the policy distributions, the precision
the passes compute in, observation normalization, and building a run's network from its settings."""
