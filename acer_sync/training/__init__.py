"""Training: the Trainer (the iteration: collect, then learn), the ACER update, callbacks (evaluation,
progress rows, checkpoints, users' own), checkpoints and their format, signals, and building a run."""
