"""Errors the CLI reports as one line and exit status 1.

    CliError
    ├── KubeconfigError      the kubeconfig cannot be loaded
    ├── ApiReadError         the API server refused or failed a read
    └── ExtenderError        the extender could not be reached or answered an error

Messages are lowercase "what: why", naming the object or address involved.
"""

from __future__ import annotations


class CliError(Exception):
    pass


class KubeconfigError(CliError):
    pass


class ApiReadError(CliError):
    pass


class ExtenderError(CliError):
    pass
