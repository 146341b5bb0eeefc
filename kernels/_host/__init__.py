"""Host-side code several ops share: device queries and occupancy (device.py), tuned-config
machinery (config.py), launch shapes (launch.py, rows.py, coop.py), where the PTX helpers may run
(prefetch.py, device.py: widen_asm), tl.dot's operands (dot.py), and the autograd of the gated
activations and of the scans (gated.py, scan.py). Imports torch and triton, never the collector;
the device code these launches run is kernels/_jit. Each op imports from the module that defines a
name (collector/codechange.py follows imports module by module)."""
