"""Built-in jobs: their parameters and privacy plans, DP-SGD training, the statistic job."""
