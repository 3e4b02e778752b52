"""Tests of cute_kernels.bench (a package so test module names stay unique)."""
