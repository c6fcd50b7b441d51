"""The families' classes by name: one place for the CLI, the report's figure and the atoms count."""

from __future__ import annotations

from nerf_pinn.experiment import Family


def family_class(name: str) -> type[Family]:
    """The `nerf_pinn.experiment.Family` subclass of family ``name`` (``pinn``, ``siren``, ``nerf``)."""
    from nerf_pinn.nerf import NerfFamily
    from nerf_pinn.pinn import PinnFamily
    from nerf_pinn.siren import SirenFamily

    return {"pinn": PinnFamily, "siren": SirenFamily, "nerf": NerfFamily}[name]
