// SHA-256 against the test vectors of FIPS 180-4's examples (NIST's published digests), fed in
// one piece and in ragged pieces (the buffering across update() calls).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/sha256.h"

namespace {

std::string digest_of(const std::string& s, std::size_t piece) {
    wush::Sha256 h;
    const auto bytes = std::as_bytes(std::span(s.data(), s.size()));
    for (std::size_t at = 0; at < bytes.size(); at += piece)
        h.update(bytes.subspan(at, std::min(piece, bytes.size() - at)));
    return wush::to_hex(h.finish());
}

struct Vector {
    std::string message, digest;
};

const std::vector<Vector> kVectors = {
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    {std::string(1000000, 'a'), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
};

TEST(Sha256, NistVectors) {
    for (const Vector& v : kVectors) {
        const std::string shown = v.message.substr(0, 20);
        EXPECT_EQ(digest_of(v.message, v.message.size() + 1), v.digest) << shown << " in one piece";
        for (std::size_t piece : {1u, 3u, 55u, 56u, 63u, 64u, 65u, 1000u})
            EXPECT_EQ(digest_of(v.message, piece), v.digest) << shown << " in pieces of " << piece;
    }
}

}  // namespace
