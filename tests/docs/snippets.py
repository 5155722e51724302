#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The code blocks of README.md and docs/*.md, checked as code.

    snippets.py check ROOT                 check every block (see below); exit 1 on a failure
    snippets.py generate ROOT OUT_DIR      write the C++ and C sources that CMake compiles
    snippets.py project ROOT NAME OUT_DIR  write the CMake project a ```cmake block marked
                                           `project NAME` is, beside the main.cpp it builds

A fenced block names its language, and some carry a marker, an HTML comment on the line
just before the fence, which the rendered page does not show:

    <!-- snippet: run -->           ```cpp: statements, compiled into one translation unit
                                    and run against the bundled model (the test runs them
                                    from a directory where build/models/tiny_mlp exists);
    <!-- snippet: compile -->       ```cpp: statements, compiled but not run (they need a
                                    GPU, a file of the reader's, ...);
    <!-- snippet: scope -->         ```cpp: declarations at namespace scope, compiled;
        `aoti` or `cuda` after any of these compiles the block only where this build has
        LibTorch >= 2.6 or torchloom::cuda;
    <!-- snippet: file PATH -->     any language: the block is the whole file PATH;
    <!-- snippet: excerpt PATH -->  any language: the block's lines appear in PATH, in a row;
    <!-- snippet: project NAME -->  ```cmake: a consumer's CMakeLists.txt for the main.cpp of
                                    examples/quickstart, built and run by a package test.

Without a marker: ```c blocks are compiled as C, ```pbtxt blocks are parsed by torchloom's
config.pbtxt parser (and their parameters checked as options) at run time, ```python
blocks must parse (python3's ast), ```sh blocks must pass `bash -n`, ```text blocks (output,
directory layouts) are not checked. A ```cpp or ```cmake block without a marker, or a block
without a language, fails the check.
"""
import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap

LANGUAGES = {"cpp", "c", "cmake", "sh", "python", "pbtxt", "text"}
CPP_KINDS = {"run", "compile", "scope"}
MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


class Block:
    def __init__(self, page, line, language, text, marker):
        self.page = page          # path relative to the root
        self.line = line          # the first line of the code (1-based)
        self.language = language
        self.text = text
        self.marker = marker.split() if marker else []

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def pages(root):
    out = ["README.md"]
    docs = os.path.join(root, "docs")
    out += sorted(os.path.join("docs", f) for f in os.listdir(docs) if f.endswith(".md"))
    return out


def blocks(root):
    for page in pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            lines = f.read().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            indent, language = m.group(1), m.group(2)
            marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
            body = []
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            yield Block(page, i + 2, language, "\n".join(body) + "\n",
                        marker.group(1) if marker else None)
            i = j + 1


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def check_block(root, b):
    """The problem with block `b`, or None."""
    if b.language not in LANGUAGES:
        return (f"a fenced block needs a language, one of {sorted(LANGUAGES)}"
                if not b.language else f"unknown language '{b.language}'")
    kind = b.marker[0] if b.marker else None
    if kind in ("file", "excerpt"):
        if len(b.marker) != 2:
            return f"'{kind}' needs one path"
        path = b.marker[1]
        if not os.path.isfile(os.path.join(root, path)):
            return f"{path} does not exist"
        text = read(root, path)
        if kind == "file":
            return None if text.rstrip("\n") == b.text.rstrip("\n") else \
                f"the block differs from {path}"
        want = textwrap.dedent(b.text).rstrip("\n").splitlines()
        have = text.splitlines()
        for start in range(len(have) - len(want) + 1):
            if textwrap.dedent("\n".join(have[start:start + len(want)])).splitlines() == want:
                return None
        return f"the block is not an excerpt of {path}"
    if b.language == "cpp":
        if kind not in CPP_KINDS:
            return ("a ```cpp block needs a marker: <!-- snippet: run|compile|scope "
                    "[aoti|cuda] -->, file PATH or excerpt PATH")
        extra = set(b.marker[1:]) - {"aoti", "cuda"}
        return f"unknown qualifiers {sorted(extra)}" if extra else None
    if b.language == "cmake":
        if kind != "project" or len(b.marker) != 2:
            return "a ```cmake block needs <!-- snippet: project NAME -->, file or excerpt"
        return None
    if b.marker:
        return f"a ```{b.language} block takes no marker but file or excerpt"
    if b.language == "python":
        try:
            ast.parse(b.text, filename=b.where)
        except SyntaxError as e:
            return f"python does not parse it: {e}"
    if b.language == "sh":
        p = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True)
        if p.returncode != 0:
            return f"bash -n: {p.stderr.strip()}"
    return None


def anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def check_links(root):
    """Links to a file that does not exist, or to a heading that its page lacks: (where,
    problem) pairs. A link to a docs/*.md page that does not exist is left alone: such a
    page is named before it is written."""
    anchors = {}
    problems = []
    link = re.compile(r"\]\(([^)\s]+)\)")
    for page in pages(root):
        in_code = False
        for n, line in enumerate(read(root, page).splitlines(), 1):
            if FENCE.match(line) or line.strip() == "```":
                in_code = not in_code
                continue
            if in_code:
                continue
            for target in link.findall(line):
                if "://" in target or target.startswith("mailto:"):
                    continue
                path, _, name = target.partition("#")
                path = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path \
                    else page
                if not os.path.exists(os.path.join(root, path)):
                    if not (path.startswith("docs" + os.sep) and path.endswith(".md")):
                        problems.append((f"{page}:{n}", f"{path} does not exist"))
                    continue
                if not name or not path.endswith(".md"):
                    continue
                if path not in anchors:
                    anchors[path] = {anchor(h.lstrip("#")) for h in read(root, path).splitlines()
                                     if re.match(r"^#{1,6} ", h)}
                if name not in anchors[path]:
                    problems.append((f"{page}:{n}", f"{path} has no heading #{name}"))
    return problems


def check(root):
    failures = 0
    for where, problem in check_links(root):
        print(f"{where}: {problem}")
        failures += 1
    counts = {}
    names = set()
    for b in blocks(root):
        counts[b.language] = counts.get(b.language, 0) + 1
        why = check_block(root, b)
        if why is None and b.language == "cmake":
            if b.marker[1] in names:
                why = f"a second cmake project named '{b.marker[1]}'"
            names.add(b.marker[1])
        if why:
            print(f"{b.where}: {why}")
            failures += 1
    summary = ", ".join(f"{n} {lang}" for lang, n in sorted(counts.items()))
    print(f"doc blocks: {summary}; {failures} failed")
    return 1 if failures else 0


def raw_string(text):
    delimiter = "snippet"
    while f"){delimiter}\"" in text:
        delimiter += "_"
    return f'R"{delimiter}({text}){delimiter}"'


def generate(root, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    includes = []
    units = []      # (where, namespace body, condition, run?)
    configs = []
    c_files = []
    for n, b in enumerate(blocks(root)):
        kind = b.marker[0] if b.marker else None
        if b.language == "c" and kind not in ("file", "excerpt"):
            name = f"doc_snippet_{n}.c"
            with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
                f.write(f'#line {b.line} "{b.page}"\n{b.text}')
            c_files.append(name)
        elif b.language == "pbtxt" and kind is None:
            configs.append(b)
        elif b.language == "cpp" and kind in CPP_KINDS:
            code = []
            for line in b.text.splitlines():
                if line.startswith("#include"):
                    if line not in includes:
                        includes.append(line)
                    code.append("")  # keeps the #line numbers right
                else:
                    code.append(line)
            code = "\n".join(code)
            conditions = []
            if "aoti" in b.marker:
                conditions.append("TORCHLOOM_TORCH_VERSION >= 20600")
            if "cuda" in b.marker:
                conditions.append("TORCHLOOM_HAS_CUDA")
            source = f'#line {b.line} "{b.page}"\n{code}\n'
            if kind != "scope":
                # Compile-only blocks are inline functions nobody calls: compiled, never
                # emitted, so what they call need not be defined anywhere.
                head = "void run() {" if kind == "run" else "inline void run() {"
                source = f"{head}\n{source}}}\n"
            units.append((b.where, f"namespace s{n} {{\n{source}}}  // namespace s{n}\n",
                          " && ".join(conditions), kind == "run", n))

    out = ["// Generated by tests/docs/snippets.py from README.md and docs/*.md: every ```cpp",
           "// block, in one translation unit. Edit the pages, not this file.",
           "#include <torchloom/torchloom.hpp>",
           "#include <torchloom/triton/config.hpp>",
           *includes,
           "", "#include <cstdio>", "#include <exception>", "#include <iostream>",
           "#include <string>", "", "namespace doc_snippets {"]
    for where, body, condition, _, _ in units:
        if condition:
            out.append(f"#if {condition}")
        out.append(body.rstrip("\n"))
        if condition:
            out.append("#endif")
    out += ["}  // namespace doc_snippets", "",
            "int main() {",
            "  int failures = 0;",
            "  int ran = 0;",
            "  const auto attempt = [&](const char* where, auto&& f) {",
            "    try {",
            "      f();",
            "      ++ran;",
            "      std::cout << \"ok: \" << where << std::endl;",
            "    } catch (const std::exception& e) {",
            "      ++failures;",
            "      std::cout << \"FAILED: \" << where << \": \" << e.what() << std::endl;",
            "    }",
            "  };"]
    for where, _, condition, runs, n in units:
        if not runs:
            continue
        if condition:
            out.append(f"#if {condition}")
        out.append(f'  attempt("{where}", [] {{ doc_snippets::s{n}::run(); }});')
        if condition:
            out.append("#endif")
    for b in configs:
        out.append(f'  attempt("{b.where} (config.pbtxt)", [] {{')
        out.append(f"    const auto config = torchloom::parse_triton_config({raw_string(b.text)}, "
                   f'"{b.where}");')
        out += ["    torchloom::runner_options options;",
                "    for (const auto& [key, value] : config.parameters) {",
                "      // The Triton backend's own parameters are not runner options.",
                "      if (key.rfind(\"TORCHLOOM_\", 0) != 0) torchloom::set_option(options, key, value);",
                "    }",
                "  });"]
    compiled = sum(1 for u in units if not u[3])
    out += [f'  std::cout << "doc snippets: " << ran << " ran, {compiled} compiled only, "',
            '            << failures << " failed" << std::endl;',
            "  return failures == 0 ? 0 : 1;", "}", ""]
    text = "\n".join(out)
    path = os.path.join(out_dir, "doc_snippets.cpp")
    # Rewritten only when it changes, so that a reconfigure does not rebuild it.
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(out_dir, "c_files.txt"), "w", encoding="utf-8") as f:
        f.write(";".join(c_files))
    return 0


def project(root, name, out_dir):
    found = [b for b in blocks(root) if b.language == "cmake" and b.marker == ["project", name]]
    if len(found) != 1:
        print(f"snippets.py: {len(found)} cmake blocks marked 'project {name}'", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "CMakeLists.txt"), "w", encoding="utf-8") as f:
        f.write(found[0].text)
    shutil.copy(os.path.join(root, "examples", "quickstart", "main.cpp"), out_dir)
    print(f"snippets.py: {found[0].where} -> {out_dir}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "check":
        sys.exit(check(args[1]))
    if len(args) == 3 and args[0] == "generate":
        sys.exit(generate(args[1], args[2]))
    if len(args) == 4 and args[0] == "project":
        sys.exit(project(args[1], args[2], args[3]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
