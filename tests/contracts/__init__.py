"""Contract suites: every engine and every cache tier passes the same tests."""
