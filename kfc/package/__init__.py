"""`kfc package`: an op as a standalone pip-installable package (kfc.package.build); the
runtime, tests and benchmark it ships (standalone.py, package_tests.py, package_bench.py) are
copied into the package, not imported by kfc."""
