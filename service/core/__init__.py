"""Service core: settings, security helpers, errors, metrics."""
