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


def tenant_counts(q) -> dict:
    """{tenant: {"waiting": n, "leased": n}} of the tenants with waiting or leased entries."""
    return {
        t: {"waiting": r["waiting"], "leased": r["leased"]}
        for t, r in q.tenants().items()
        if r["waiting"] or r["leased"]
    }


def tenant_deliveries(q) -> dict:
    """{tenant: deliveries so far} of the tenants with deliveries."""
    return {t: r["deliveries"] for t, r in q.tenants().items() if r["deliveries"]}


def held_tenants(q) -> dict:
    """{tenant: why it cannot be served now} of the tenants held back."""
    return {t: r["held"] for t, r in q.tenants().items() if r["held"]}


def pauses(q) -> tuple:
    """(whether the queue is paused, its paused tenants) as the queue recorded them."""
    state = q.recorded()
    return state["paused"], state["paused_tenants"]
