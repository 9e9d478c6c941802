// One request/answer channel between the harness and an isolated plugin's child process: the bytes go
// through a shared memory file (memfd) both processes map, a socket pair carries {op, size}. Made
// before fork; each side then keeps its end. One message is in flight at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dflash {

class Channel {
 public:
  Channel();  // throws internal_error when the system refuses a memfd or socket pair
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void keep_parent_end();  // after fork, in the parent
  void keep_child_end();   // after fork, in the child

  // False when the other side is gone.
  bool send(uint32_t op, const std::string& payload);
  enum class Wait { kMessage, kTimeout, kClosed };
  // timeout_ms < 0 waits for ever.
  Wait receive(uint32_t* op, std::string* payload, int timeout_ms);
  // Closes this side's socket: the other side's receive sees kClosed.
  void close();

 private:
  void map_at_least(size_t bytes);
  int memfd_ = -1;
  int sockets_[2] = {-1, -1};
  int mine_ = -1;  // index into sockets_ this process uses
  char* map_ = nullptr;
  size_t mapped_ = 0;
};

}  // namespace dflash
