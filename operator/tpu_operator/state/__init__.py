"""Compact views of cluster objects and pure assessments over them."""
