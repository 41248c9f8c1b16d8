"""std::mt19937_64 in Python, for the bench scripts that draw the sizes the C++ benches draw."""


def mt19937_64(seed):
    """std::mt19937_64, so that the sizes are those of the C++ bench."""
    m64 = (1 << 64) - 1
    mt = [seed & m64]
    for i in range(1, 312):
        mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & m64)
    while True:
        for i in range(312):
            x = (mt[i] & ~0x7FFFFFFF & m64) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            mt[i] = mt[(i + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
        for y in mt:
            y ^= (y >> 29) & 0x5555555555555555
            y ^= (y << 17) & 0x71D67FFFEDA60000
            y ^= (y << 37) & 0xFFF7EEE000000000
            yield y ^ (y >> 43)
