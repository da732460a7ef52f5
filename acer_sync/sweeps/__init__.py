"""The sweep launcher behind sweep.py: sweep files, the Ray Tune trial, the Tuner, the summary."""
