"""The serving core: repository, registry, model handles, execution and the service facade."""
