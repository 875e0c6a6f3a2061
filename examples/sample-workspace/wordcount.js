"use strict";
// The JavaScript twin of wordcount.py: a tiny project standing in for untrusted code.

function wordCount(text) {
  const counts = {};
  for (const word of text.toLowerCase().split(/\s+/).filter(Boolean)) {
    counts[word] = (counts[word] || 0) + 1;
  }
  return counts;
}

module.exports = { wordCount };
