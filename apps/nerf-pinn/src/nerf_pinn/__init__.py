"""Coordinate networks with linearized MLPs: PINN (Burgers), SIREN, NeRF."""
