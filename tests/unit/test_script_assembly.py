"""The scripts' assembly (celery_pq.scripts.assembly): each script carries only the helpers it calls."""


def test_scripts_carry_only_the_helpers_they_call():
    import re

    from celery_pq.scripts import SCRIPT_NAMES, source
    from celery_pq.scripts.assembly import _without_unused_functions

    text = (
        "local function a()\n  return b()\nend\n"
        "local function b()\n  return 1\nend\n"
        "local function unused()\n  return a()\nend\n"
        "return a()\n"
    )
    assert _without_unused_functions(text) == (
        "local function a()\n  return b()\nend\nlocal function b()\n  return 1\nend\nreturn a()\n"
    )
    for name in SCRIPT_NAMES:  # every helper left in a script is named somewhere else in it
        body = source(name)
        for helper in re.findall(r"^local function (\w+)\(", body, re.M):
            assert len(re.findall(rf"\b{helper}\b", body)) >= 2, (name, helper)
    assert "local function fair_add" not in source("pop") and "local function to_dead" not in source("ack")
