"""Which peer packages import on this machine, one line each (QuACK and FlashAttention-4 need the
CuTe DSL's packages: lab/gpu_env.sh puts them on the path). `python -m lab.peers`"""
import importlib

PEERS = ("cutlass", "quack", "flash_attn.cute", "liger_kernel", "fla", "mlstm_kernels", "xlstm", "cortex")

if __name__ == "__main__":
    for name in PEERS:
        try:
            importlib.import_module(name)
            print(name, "imports")
        except Exception as e:  # noqa: BLE001 - any failure to import is what this reports
            print(name, "fails:", type(e).__name__, str(e)[:300])
