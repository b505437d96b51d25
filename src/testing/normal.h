// A fast N(0, 1) source for drawing large synthetic layers: the ziggurat method of Marsaglia and
// Tsang (J. Stat. Software 5(8), 2000) with 128 layers, on a splitmix64 stream.
//
// Why: std::normal_distribution over std::mt19937_64 took 23 ns a sample here, two thirds of the
// 36 ns a weight that drawing and quantising a layer cost on one thread (session 17): DeepSeek-V3's
// 11.3 G weights took 49 s on the device machine's 16 threads before every bench and check of it.
// The ziggurat takes one draw, a table load, a multiply and a compare for ~99 % of samples.
//
// Layers: x_1 < … < x_127 = R with equal areas V (rectangles plus the tail under layer 0). A draw
// picks layer i and a signed 32-bit hz, the point hz · w[i]; inside the layer's rectangle
// wholly below the curve (|hz| < k[i]) it is returned, otherwise the wedge is tested against
// exp(−x²/2), or for layer 0 a sample of the tail beyond R is drawn (Marsaglia's exponential
// method). Used by testkit's kPerExpert layers (the benches); the tests' kSequential draws keep
// std::normal_distribution.
#pragma once

#include <cmath>
#include <cstdint>

namespace fp4moe::testkit {

class ZigguratNormal {
 public:
  explicit ZigguratNormal(uint64_t seed) : state_(seed) {}

  // One 64-bit draw a sample: its low 32 bits the point, 7 of its high bits the layer (taking the
  // layer from the point's own low bits, as the 2000 paper does, correlates the two; Doornik 2005).
  float operator()() {
    const uint64_t r = next64();
    const int32_t hz = static_cast<int32_t>(static_cast<uint32_t>(r));
    const uint32_t iz = static_cast<uint32_t>(r >> 57);
    if (magnitude(hz) < tables().k[iz]) return static_cast<float>(hz * tables().w[iz]);
    return slow(hz, iz);
  }

 private:
  struct Tables {
    uint32_t k[128];
    double w[128], f[128];
  };
  static constexpr double kR = 3.442619855899;           // x_127: where the tail begins
  static constexpr double kV = 9.91256303526217e-3;      // each layer's area
  static constexpr double kScale = 2147483648.0;         // 2^31: hz · w[i] spans layer i's width

  static const Tables& tables() {
    static const Tables t = [] {
      Tables b{};
      double dn = kR, tn = kR;
      const double q = kV / std::exp(-0.5 * dn * dn);
      b.k[0] = static_cast<uint32_t>((dn / q) * kScale);
      b.k[1] = 0;
      b.w[0] = q / kScale;
      b.w[127] = dn / kScale;
      b.f[0] = 1.0;
      b.f[127] = std::exp(-0.5 * dn * dn);
      for (int i = 126; i >= 1; --i) {
        dn = std::sqrt(-2.0 * std::log(kV / dn + std::exp(-0.5 * dn * dn)));
        b.k[i + 1] = static_cast<uint32_t>((dn / tn) * kScale);
        tn = dn;
        b.f[i] = std::exp(-0.5 * dn * dn);
        b.w[i] = dn / kScale;
      }
      return b;
    }();
    return t;
  }

  static uint32_t magnitude(int32_t v) {  // |v| without overflow at INT32_MIN (2^31: never inside)
    return v < 0 ? 0u - static_cast<uint32_t>(v) : static_cast<uint32_t>(v);
  }

  uint64_t next64() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next64() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0, 1)

  float slow(int32_t hz, uint32_t iz) {
    const Tables& t = tables();
    for (;;) {
      const double x = hz * t.w[iz];
      if (iz == 0) {  // the tail beyond R
        double xt, y;
        do {
          xt = -std::log(uniform()) / kR;
          y = -std::log(uniform());
        } while (y + y < xt * xt);
        return static_cast<float>(hz > 0 ? kR + xt : -kR - xt);
      }
      if (t.f[iz] + uniform() * (t.f[iz - 1] - t.f[iz]) < std::exp(-0.5 * x * x)) return static_cast<float>(x);
      const uint64_t r = next64();
      hz = static_cast<int32_t>(static_cast<uint32_t>(r));
      iz = static_cast<uint32_t>(r >> 57);
      if (magnitude(hz) < t.k[iz]) return static_cast<float>(hz * t.w[iz]);
    }
  }

  uint64_t state_;
};

}  // namespace fp4moe::testkit
