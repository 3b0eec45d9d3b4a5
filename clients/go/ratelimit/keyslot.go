package ratelimit

import "strings"

// KeySlot is the Redis Cluster slot of key (0 to 16383): CRC16 (XMODEM) of
// the key, or of its hash tag, mod 16384. A hash tag is what lies between
// the first '{' and the next '}' when that is not empty: "{orders}:user:42"
// and "{orders}:all" share a slot, as RL.ALL's keys must on a cluster.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), Redis Cluster's.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
