"""The live engine of the service: event validation, one matcher per query, alerts, restart replay."""
