"""Exclusive placement of multi-host slices on GKE TPU node pools."""
