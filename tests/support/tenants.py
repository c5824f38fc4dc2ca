"""Tenant key functions for the tests (``fair_key="tests.support.tenants:..."``)."""


def by_body(message):
    """The tenant is the first argument of the task / the 'tenant' field of a kombu body."""
    from kombu.utils.json import loads

    body = loads(message["body"]) if isinstance(message["body"], (str, bytes)) else message["body"]
    if isinstance(body, dict):
        return body.get("tenant")
    return body[0][0]


def explode(message):
    raise RuntimeError("tenant service is down")


def not_a_string(message):
    return 42
