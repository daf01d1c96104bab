"""`inferd fleet`: a plan run on this machine, each bin a local inferd, behind a real nginx routed
as the Kubernetes Ingress is (both from the plan's routes), to exercise and load-test a fleet."""

from inferd.tools.fleet.local import ROLLOUTS, Fleet, FleetError, down, load, restart, status, up
from inferd.tools.fleet.nginx import nginx_config

__all__ = ["ROLLOUTS", "Fleet", "FleetError", "down", "load", "nginx_config", "restart", "status", "up"]
