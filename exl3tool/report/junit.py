"""JUnit XML rendering of a `Report`: one test case per rule family, failing on its errors.

CI systems (GitLab, Jenkins, Azure) show JUnit natively. A family (ST, CK, EX, R7 ...) with
error findings is a failed test case listing them; warnings and infos go to its system-out
(they fail too with `strict=True`, like `--strict`). Families without findings pass.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict

from exl3tool.report.model import Report
from exl3tool.rules.registry import Finding, Severity, all_rules, family_of

# Characters XML 1.0 cannot carry, even escaped (and lone surrogates, which cannot be encoded).
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    return _XML_BAD.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _line(f: Finding) -> str:
    where = ", ".join(
        x
        for x in (
            f.location.file,
            f.location.tensor and f"tensor {f.location.tensor}",
            f.location.pointer and f"at {f.location.pointer}",
        )
        if x
    )
    return f"{f.level.value} {f.code} {f.message}" + (f" ({where})" if where else "")


def to_junit(report: Report, *, strict: bool = False) -> str:
    """The report as JUnit XML (a `testsuites` root with one `testsuite`)."""
    by_family: dict[str, list[Finding]] = defaultdict(list)
    for r in all_rules():
        by_family[family_of(r.code)]
    for f in report.findings:
        by_family[family_of(f.code)].append(f)
    failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}

    suite = ET.Element("testsuite", name="exl3tool")
    props = ET.SubElement(suite, "properties")
    for a in report.artifacts:
        ET.SubElement(props, "property", name="artifact", value=xml_safe(f"{a.path} ({a.kind})"))
    failures = 0
    for fam in sorted(by_family):
        items = sorted(by_family[fam], key=lambda f: (-f.level.rank, f.code))
        case = ET.SubElement(suite, "testcase", classname=f"exl3tool.{fam}", name=fam, time="0")
        bad = [f for f in items if f.level in failing]
        if bad:
            failures += 1
            fail = ET.SubElement(
                case,
                "failure",
                type="error" if any(f.level is Severity.ERROR for f in bad) else "warning",
                message=xml_safe(f"{len(bad)} finding(s) of rule family {fam}"),
            )
            fail.text = xml_safe("\n".join(_line(f) for f in bad))
        rest = [f for f in items if f.level not in failing]
        if rest:
            ET.SubElement(case, "system-out").text = xml_safe("\n".join(_line(f) for f in rest))
    counts = {"tests": str(len(by_family)), "failures": str(failures), "errors": "0"}
    counts["skipped"] = "0"
    suite.attrib.update(counts)
    root = ET.Element("testsuites", name="exl3tool", **{k: counts[k] for k in counts})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
