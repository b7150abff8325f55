"""Recipes built only on the RegistryCenter protocol, so they behave alike on every backend."""
