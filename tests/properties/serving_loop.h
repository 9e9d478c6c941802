// Property 11, the serving loop (docs/properties.md): what a serving engine does to a drafter
// between proposes, interleaved at random, must never change a propose's bits. One drafter serves
// seeded random traces of block widths and batch compositions (sequences joining, leaving, others
// taking their place, each batch in a shuffled order so sequences move between batch slots),
// contexts growing past the window, pages reused after releases, and, on a drafter with graphs,
// graph captures and replays across all of these. After every propose, each sequence's logits and
// draft tokens must equal, bit for bit, those of a fresh eager drafter fed the same history: the
// sequence's every context row in one prompt, then the same anchor at the same width, alone.
#pragma once
#include "tests/properties/backends.h"

namespace dflash::prop {

// `loop` serves the trace; `eager` builds the fresh drafters (the same drafter with graphs off;
// on the CPU, the working reference). Counts the cases in which `loop` replayed a graph into
// *cases_with_graph_replays when given (a backend without graphs never does).
void serving_loop_property(const Backend& loop, const Backend& eager, int* cases_with_graph_replays = nullptr);

}  // namespace dflash::prop
