import torch

# Tiny sizes: one thread is faster than several and robust on a shared CPU.
torch.set_num_threads(1)
