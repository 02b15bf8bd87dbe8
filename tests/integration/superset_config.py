"""Superset's configuration for the tests and ``make superset`` (SUPERSET_CONFIG_PATH names this
file; tests/integration/superset_env.py sets the variables it reads). Not imported by the tests.

A local instance for one person or one test: SQLite metadata, no caches, no telemetry.
"""

import os

SECRET_KEY = os.environ["FEDERATOR_SUPERSET_SECRET_KEY"]
SQLALCHEMY_DATABASE_URI = "sqlite:///" + os.environ["FEDERATOR_SUPERSET_DB"]

# No CSRF tokens: headless Chromium, which cannot carry a session cookie in, signs in by posting
# the login form from a page of its own, and the form's token is bound to a session it lacks.
# Acceptable for a local instance on 127.0.0.1; never for a shared one.
WTF_CSRF_ENABLED = False
AUTH_RATE_LIMITED = False  # the tests sign in more than Superset's default allows a minute
SCARF_ANALYTICS = False
CACHE_CONFIG = DATA_CACHE_CONFIG = {"CACHE_TYPE": "NullCache"}  # every chart asks the database
SQLLAB_TIMEOUT = 60
