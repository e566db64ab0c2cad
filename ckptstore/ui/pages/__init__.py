"""Page handlers, one module per kind of thing (experiments, trials, checkpoints, models)."""
