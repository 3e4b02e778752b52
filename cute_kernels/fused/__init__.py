"""Fused memory-bound kernels (layer 4)."""
