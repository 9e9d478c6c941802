#include "plugin/channel.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace dflash {
namespace {

struct Header {
  uint32_t op;
  uint32_t pad;
  uint64_t size;
};

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);  // no SIGPIPE when the child is gone
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// 1: read n bytes; 0: the other side closed.
int read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 1;
}

}  // namespace

Channel::Channel() {
  memfd_ = memfd_create("dflash-plugin", MFD_CLOEXEC);
  if (memfd_ < 0) throw internal_error(std::string("plugin isolation: memfd_create failed: ") + std::strerror(errno));
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets_) != 0) {
    ::close(memfd_);
    throw internal_error(std::string("plugin isolation: socketpair failed: ") + std::strerror(errno));
  }
}

Channel::~Channel() {
  close();
  if (map_ != nullptr) munmap(map_, mapped_);
  if (memfd_ >= 0) ::close(memfd_);
}

void Channel::keep_parent_end() {
  ::close(sockets_[1]);
  sockets_[1] = -1;
  mine_ = 0;
}

void Channel::keep_child_end() {
  ::close(sockets_[0]);
  sockets_[0] = -1;
  mine_ = 1;
}

void Channel::close() {
  for (int& fd : sockets_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void Channel::map_at_least(size_t bytes) {
  struct stat st {};
  if (fstat(memfd_, &st) != 0) throw internal_error(std::string("plugin isolation: fstat: ") + std::strerror(errno));
  size_t size = static_cast<size_t>(st.st_size);
  if (size < bytes) {  // this side grows the file; the other maps the new size when it reads
    size = std::max(bytes, 2 * size);
    if (ftruncate(memfd_, static_cast<off_t>(size)) != 0) {
      throw internal_error("plugin isolation: cannot grow the shared memory to " + std::to_string(size) +
                           " bytes: " + std::strerror(errno));
    }
  }
  if (size <= mapped_) return;
  if (map_ != nullptr) munmap(map_, mapped_);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
  if (p == MAP_FAILED) {
    map_ = nullptr;
    mapped_ = 0;
    throw internal_error("plugin isolation: cannot map " + std::to_string(size) + " bytes: " + std::strerror(errno));
  }
  map_ = static_cast<char*>(p);
  mapped_ = size;
}

bool Channel::send(uint32_t op, const std::string& payload) {
  if (mine_ < 0 || sockets_[mine_] < 0) return false;
  if (!payload.empty()) {
    map_at_least(payload.size());
    std::memcpy(map_, payload.data(), payload.size());
  }
  const Header header{op, 0, payload.size()};
  return write_all(sockets_[mine_], &header, sizeof header);
}

Channel::Wait Channel::receive(uint32_t* op, std::string* payload, int timeout_ms) {
  if (mine_ < 0 || sockets_[mine_] < 0) return Wait::kClosed;
  const int fd = sockets_[mine_];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return Wait::kTimeout;
      wait_ms = static_cast<int>(left.count());
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) throw internal_error(std::string("plugin isolation: poll: ") + std::strerror(errno));
    if (ready == 0) return Wait::kTimeout;
    break;
  }
  Header header{};
  if (!read_all(fd, &header, sizeof header)) return Wait::kClosed;
  *op = header.op;
  payload->clear();
  if (header.size > 0) {
    map_at_least(header.size);
    payload->assign(map_, header.size);
  }
  return Wait::kMessage;
}

}  // namespace dflash
