"""Who may call and how much: tenants and their keys, the cached directory,
rate and pending quotas, and admission of new schedules. Pure but for the
tenant source the directory is given (``node/store/tenants.py``)."""
