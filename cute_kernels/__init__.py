"""cute-kernels: a workbench for speed-of-light GPU kernels on CuTe's layout algebra.

Importing the package is cheap: subpackages that need torch or the CuTe DSL are imported
only when used, so `cute_kernels.layouts` works on any machine.
"""

__version__ = "0.1.0"
