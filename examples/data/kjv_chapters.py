#!/usr/bin/env python3
"""Group the verses printed by the `bible` program of Debian's bible-kjv (one "Ge1:1 text" line per
verse) into the shipped corpus format: one paragraph per chapter, a heading line "<Book> <chapter>"
followed by the verse texts one per line, paragraphs separated by a blank line.

    python3 kjv_chapters.py kjv.txt > kjv_bible.txt
    python3 kjv_chapters.py --books 5 kjv.txt > kjv_pentateuch.txt
"""
import argparse
import re
import sys

# The program's abbreviations, in canonical order, and the names used in the headings.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"), ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"),
    ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"),
    ("Nahum", "Nahum"), ("Hab", "Habakkuk"), ("Zep", "Zephaniah"), ("Hag", "Haggai"),
    ("Zec", "Zechariah"), ("Mal", "Malachi"), ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"),
    ("John", "John"), ("Acts", "Acts"), ("Rom", "Romans"), ("1Cor", "1 Corinthians"),
    ("2Cor", "2 Corinthians"), ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"),
    ("Col", "Colossians"), ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"),
    ("1Tim", "1 Timothy"), ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"),
    ("Heb", "Hebrews"), ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"),
    ("1Jn", "1 John"), ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verses", help="the bible program's output, one 'Ge1:1 text' line per verse")
    parser.add_argument("--books", type=int, default=len(BOOKS), help="keep the first N books (default: all 66)")
    args = parser.parse_args()
    names = dict(BOOKS[: args.books])
    verse = re.compile(r"^([0-9]?[A-Za-z]+)([0-9]+):([0-9]+) (.*)$")
    chapters = []  # [heading, [verses]]
    with open(args.verses, encoding="ascii") as f:
        for number, line in enumerate(f, 1):
            m = verse.match(line.rstrip("\n"))
            if not m:
                sys.exit(f"{args.verses}:{number}: not a 'Book1:1 text' verse line: {line[:60]!r}")
            book, chapter, text = m.group(1), m.group(2), m.group(4)
            if book not in dict(BOOKS):
                sys.exit(f"{args.verses}:{number}: unknown book abbreviation {book!r}")
            if book not in names:
                continue
            heading = f"{names[book]} {chapter}"
            if not chapters or chapters[-1][0] != heading:
                chapters.append([heading, []])
            chapters[-1][1].append(text)
    sys.stdout.write("\n".join(heading + "\n" + "\n".join(verses) + "\n" for heading, verses in chapters))


if __name__ == "__main__":
    main()
