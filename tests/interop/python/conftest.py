"""Keeps each phase's report on the test item (item.rep_setup, rep_call, rep_teardown), so a
fixture can tell in its teardown whether the case failed (test_rls_interop.py prints sluiced's
output then)."""
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
