"""The instance catalog: the machine types a plan may buy, with their capacity and hourly price.
A YAML file (checked with pydantic: one line names what is wrong and where); inferd ships one
(`catalog.yaml` beside this module) with dated public prices and its source named."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_CATALOG = Path(__file__).with_name("catalog.yaml")


class CatalogError(ValueError):
    """The catalog cannot be used: one line says why."""


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    vcpu: int
    memory_gb: float
    price_per_hour: float
    accelerator: str = ""
    """The accelerator kind ("" for none), matched against a profile's machine.accelerator."""
    accelerators: int = 0
    accelerator_memory_gb: float = 0.0
    """Per device."""


@dataclass(frozen=True, slots=True)
class Catalog:
    instances: tuple[InstanceType, ...]
    source: str = ""
    prices_as_of: str = ""
    currency: str = "USD"

    def only(self, names: tuple[str, ...]) -> Catalog:
        """The catalog restricted to `names` (in the catalog's order)."""
        known = {t.name for t in self.instances}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise CatalogError(f"instance types {unknown} are not in the catalog (it has {sorted(known)})")
        return Catalog(tuple(t for t in self.instances if t.name in names), self.source, self.prices_as_of,
                       self.currency)  # fmt: skip


class _Instance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    vcpu: int = Field(gt=0)
    memory_gb: float = Field(gt=0)
    price_per_hour: float = Field(gt=0)
    accelerator: str = ""
    accelerators: int = Field(default=0, ge=0)
    accelerator_memory_gb: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _accelerator_complete(self) -> _Instance:
        if bool(self.accelerator) != (self.accelerators > 0) or bool(self.accelerator) != (
            self.accelerator_memory_gb > 0
        ):
            raise ValueError("accelerator, accelerators and accelerator_memory_gb go together (all or none)")
        return self


class _Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = ""
    prices_as_of: str = ""
    currency: str = "USD"
    instances: list[_Instance] = Field(min_length=1)


def load_catalog(path: Path | None = None) -> Catalog:
    path = path or DEFAULT_CATALOG
    try:
        document = yaml.safe_load(path.read_text("utf-8"))
        parsed = _Catalog.model_validate(document)
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path} is not YAML: {exc}") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise CatalogError(f"{path}: {where}: {error['msg']}") from None
    names = [i.name for i in parsed.instances]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CatalogError(f"{path}: instance types {duplicates} appear more than once")
    instances = tuple(InstanceType(**i.model_dump()) for i in parsed.instances)
    return Catalog(instances, parsed.source, parsed.prices_as_of, parsed.currency)
