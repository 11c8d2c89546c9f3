"""What the panels draw, as plain models with no Textual in them.

Handlers append the engine's events here; a redraw timer reads them. `buffers.Telemetry`
is the aggregate a screen is given: the ring buffers, the request `timeline`, each
request's `request_status`, the latest `preemption`, the `token_explainer`'s reasons and
the `host_watch`. An import-linter contract keeps Textual out of this package.
"""
