// sentence_splitter.hpp: the sentence splitter of preprocess_data --split-sentences. A short rule
// set, NOT NLTK's punkt (which Megatron uses): punkt learns abbreviations and sentence starters
// from a trained model per language; this splitter knows a fixed list of English abbreviations
// and the shape of a sentence end, and is the same for every --lang. Expect the two to differ on
// abbreviations outside the list, on initials and on quoted speech.
//
// A sentence ends after a run of '.', '!', '?' (or the ellipsis U+2026), then any closing quotes
// and brackets (" ' ) ] } and U+2019 U+201D U+00BB), when whitespace follows and then more text,
// except when
//   - the next non-space character is a lowercase ASCII letter ("e.g. this", "3 p.m. on"), or
//   - the run is a single '.' after a single letter ("J. Smith"), after a word with a '.' inside
//     ("e.g.", "U.S."), or after a listed abbreviation (Mr. Mrs. Ms. Dr. Prof. St. Jr. Sr. vs.
//     Mt. Lt. Col. Gen. Capt. Gov. Rev. Fig. Inc. Ltd. Co. Corp. Dept. approx., any case).
//
// The pieces are slices of the text, as punkt's span_tokenize gives them:
//   keep_newlines = false (punkt): a sentence ends at its closing punctuation; the whitespace after
//     it is dropped, so the newlines between sentences are lost.
//   keep_newlines = true (Megatron's CustomLanguageVars): the whitespace after a sentence stays at
//     its end, so the sentences put together give back the text.
// In both, the first sentence keeps any leading whitespace, whitespace at the end of the text is
// dropped (NLTK >= 3.8), and a text of only whitespace has no sentence at all.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <vector>

namespace strata::tools {

namespace sentence_detail {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Length of the sentence-final punctuation at `i` ('.', '!', '?', or U+2026), 0 if none.
inline std::size_t terminal_at(std::string_view t, std::size_t i) {
  if (t[i] == '.' || t[i] == '!' || t[i] == '?') return 1;
  if (t.substr(i, 3) == "\xE2\x80\xA6") return 3;
  return 0;
}
// Length of a closing quote or bracket at `i`, 0 if none.
inline std::size_t closer_at(std::string_view t, std::size_t i) {
  const char c = t[i];
  if (c == '"' || c == '\'' || c == ')' || c == ']' || c == '}') return 1;
  if (t.substr(i, 3) == "\xE2\x80\x99" || t.substr(i, 3) == "\xE2\x80\x9D") return 3;  // ’ ”
  if (t.substr(i, 2) == "\xC2\xBB") return 2;                                              // »
  return 0;
}

inline bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (x != b[i]) return false;
  }
  return true;
}

// The word that ends right before a single '.' at `dot`: an abbreviation the period belongs to?
inline bool is_abbreviation_before(std::string_view t, std::size_t dot) {
  std::size_t begin = dot;
  while (begin > 0 && !is_space(t[begin - 1])) --begin;
  std::string_view word = t.substr(begin, dot - begin);
  while (!word.empty() && (word.front() == '(' || word.front() == '"' || word.front() == '\'' || word.front() == '['))
    word.remove_prefix(1);
  if (word.empty()) return false;
  if (word.size() == 1 && ((word[0] >= 'A' && word[0] <= 'Z') || (word[0] >= 'a' && word[0] <= 'z'))) return true;
  if (word.find('.') != std::string_view::npos) return true;
  static constexpr std::array<std::string_view, 24> kAbbreviations = {
      "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "mt", "lt", "col",
      "gen", "capt", "gov", "rev", "fig", "inc", "ltd", "co", "corp", "dept", "approx", "messrs"};
  for (std::string_view a : kAbbreviations)
    if (equals_ignoring_case(word, a)) return true;
  return false;
}

}  // namespace sentence_detail

// The sentences of `text`, as views into it (see the note at the top for the rules).
inline std::vector<std::string_view> split_sentences(std::string_view text, bool keep_newlines) {
  using namespace sentence_detail;
  std::vector<std::string_view> sentences;
  std::size_t stop = text.size();
  while (stop > 0 && is_space(text[stop - 1])) --stop;
  if (stop == 0) return sentences;
  std::size_t start = 0, i = 0;
  while (i < stop) {
    const std::size_t first = terminal_at(text, i);
    if (first == 0) {
      ++i;
      continue;
    }
    // The run of terminal punctuation, then the closers.
    std::size_t end = i, terminals = 0;
    bool single_period = text[i] == '.';
    while (end < stop) {
      const std::size_t n = terminal_at(text, end);
      if (n == 0) break;
      end += n;
      ++terminals;
    }
    single_period = single_period && terminals == 1;
    while (end < stop) {
      const std::size_t n = closer_at(text, end);
      if (n == 0) break;
      end += n;
    }
    std::size_t next = end;
    while (next < stop && is_space(text[next])) ++next;
    const bool boundary = next > end && next < stop && !(text[next] >= 'a' && text[next] <= 'z') &&
                          !(single_period && is_abbreviation_before(text, i));
    if (boundary) {
      sentences.push_back(text.substr(start, (keep_newlines ? next : end) - start));
      start = next;
    }
    i = end > i ? end : i + 1;
  }
  sentences.push_back(text.substr(start, stop - start));
  return sentences;
}

}  // namespace strata::tools
