"""SQL: parse with sqlglot, bind to the catalog, plan into per-partition queries, evaluate on Arrow."""
