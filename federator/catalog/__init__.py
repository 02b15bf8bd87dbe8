"""Store definitions and the catalog topic that holds them."""

from federator.catalog.catalog import Catalog, CatalogConflict, catalog_topic, changelog_topic
from federator.catalog.definition import DefinitionError, StoreDefinition, parse_value_fields

__all__ = [
    "Catalog",
    "CatalogConflict",
    "DefinitionError",
    "StoreDefinition",
    "catalog_topic",
    "changelog_topic",
    "parse_value_fields",
]
