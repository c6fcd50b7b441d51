"""``python -m nerf_pinn``: the ``nerf-pinn`` command."""

from nerf_pinn.cli import main

raise SystemExit(main())
