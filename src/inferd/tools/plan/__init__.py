"""`inferd plan`: the cheapest fleet that holds every profiled model at its expected load, as
multi-dimensional bin packing (memory, CPU, accelerator memory and accelerator time per instance)
solved with OR-Tools CP-SAT over a priced instance catalog; written as a plan file that
`inferd deploy` and `inferd fleet` read."""

from inferd.tools.plan.catalog import Catalog, CatalogError, InstanceType, load_catalog
from inferd.tools.plan.demand import Limits, PlanError
from inferd.tools.plan.plan_file import Plan, PlannedInstance, PlannedModel
from inferd.tools.plan.run import PlanSettings, run_plan

__all__ = [
    "Catalog",
    "CatalogError",
    "InstanceType",
    "Limits",
    "Plan",
    "PlanError",
    "PlanSettings",
    "PlannedInstance",
    "PlannedModel",
    "load_catalog",
    "run_plan",
]
