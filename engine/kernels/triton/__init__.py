"""The Triton kernels, each with its launcher; their torch references and dispatchers are the
modules of the same name one level up (engine/kernels/<op>.py). Importing this package imports
no triton: decode_attention and extend_attention need it, the others import it only if it is
installed (launch.py)."""
