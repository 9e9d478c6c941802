// `report A.json B.json C.json`: the shards of one run (`replay --shard I/N`) merged back into the
// document the unsharded run would have written, or documents that are not shards kept as they are.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

// `documents` as read_report_document returns them, `names` their files (for the messages).
// Without shards among them, returns them as they are. With shards, all of them must be the shards
// of one run, each once and none missing; refused by name (kBadInput) otherwise: a document that is
// not a shard among shards, a different shard count, backend, precision or set of fixtures, a
// shard given twice, a missing shard, a fixture in no shard or in two. Returns then the one merged
// document: version 2, "run" of the first document given with shard null, results and errors in
// its fixture order (shards may have been given the fixtures in other orders).
std::vector<nlohmann::json> merge_reports(const std::vector<nlohmann::json>& documents,
                                          const std::vector<std::string>& names);

}  // namespace dflash
