"""Training progress from the workers' metrics: sampling, stalls, stragglers, goodput."""
