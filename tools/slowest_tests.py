#!/usr/bin/env python3
"""Prints the slowest tests of a nextest JUnit report: where CI's time goes.

    tools/slowest_tests.py [target/nextest/ci/junit.xml] [count]
"""
import sys
import xml.etree.ElementTree as ElementTree


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "target/nextest/ci/junit.xml"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    cases = [
        (float(case.get("time", 0)), f"{case.get('classname')} {case.get('name')}")
        for case in ElementTree.parse(path).iter("testcase")
    ]
    cases.sort(reverse=True)
    print(f"{len(cases)} tests, {sum(t for t, _ in cases):.0f} s in all; the slowest:")
    for seconds, name in cases[:count]:
        print(f"{seconds:8.1f} s  {name}")


if __name__ == "__main__":
    main()
