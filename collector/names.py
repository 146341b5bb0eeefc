"""The modes and dtypes by name, for the command line: without torch, so that the commands that never
measure (summary, export, import, compare, build-site, --help) start without importing it."""
MODES = ("fwd", "bwd", "fwd+bwd")
DTYPE_CHOICES = ("bfloat16", "float16", "float32")  # spec.DTYPES maps each to its torch dtype
