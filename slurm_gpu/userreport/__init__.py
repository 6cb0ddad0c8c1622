"""User-facing job reports: view model, adapter, terminal and JSON renderers."""
