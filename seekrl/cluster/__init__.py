"""Running one job over several processes and machines: `seekrl launch` on Ray (ray_launch.py).

The trainer's ranks themselves (torch.distributed, FSDP) are in seekrl/parallel/; this package
only places them and the engine servers, wires them together and takes everything down.
"""
