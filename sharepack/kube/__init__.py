"""Kubernetes plumbing both processes use: the one list+watch reflector (`kube.reflecting`).

Imports no sharepack package: the agent and the extender stay independent of each other
(import-linter contracts in pyproject.toml)."""
