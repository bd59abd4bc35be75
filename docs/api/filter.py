#!/usr/bin/env python3
"""docs/api/filter.py FILE: a header as Doxygen should read it (Doxygen's INPUT_FILTER).

strata's headers comment in plain // lines. This prints FILE with
  - its opening comment block (the file's description) as the file's documentation (\\file),
  - every other comment that fills a line (// ...) as a documentation comment (/// ...), which
    Doxygen attaches to the declaration below it; separator lines (// ---) stay plain,
  - in documentation text, the characters Doxygen would read as commands or markup escaped, so the
    comments appear as written.
Code lines are unchanged, so line numbers match the header.
"""
import re
import sys

ESCAPE = re.compile(r'([\\@<>&#%$])')


def doc(text):
    """Escapes Doxygen's command and markup characters outside `code spans` (those stay literal)."""
    parts = text.split('`')
    if len(parts) % 2 == 0:  # an unbalanced backtick: no code spans on this line
        return ESCAPE.sub(r'\\\1', text).replace('`', "'")
    return '`'.join(part if k % 2 else ESCAPE.sub(r'\\\1', part) for k, part in enumerate(parts))


def main(path):
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    out = []
    i = 0
    # The opening block of // lines, the file's description, as one \file comment of as many lines.
    block = []
    while i < len(lines) and lines[i].startswith('//'):
        block.append(re.sub(r'^// ?', '', lines[i]))
        i += 1
    for n, text in enumerate(block):
        out.append('/// ' + doc(text) + (' \\file' if n == len(block) - 1 else ''))  # \file last: it names no file
    comment = re.compile(r'^(\s*)//(?!/)\s?(.*)$')
    for line in lines[i:]:
        m = comment.match(line)
        if not m:
            out.append(line)
            continue
        indent, text = m.groups()
        if re.fullmatch(r'[-=*\s]*', text):
            out.append(line)  # a separator
        else:
            out.append(indent + '/// ' + doc(text))
    sys.stdout.write('\n'.join(out))


if __name__ == '__main__':
    main(sys.argv[1])
