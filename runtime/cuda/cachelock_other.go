//go:build !unix

package cuda

import (
	"context"
	"errors"
)

// lock is unavailable without flock: every Builder compiles what the cache
// lacks itself.
func (c *Cache) lock(context.Context, CacheKey, bool) (func(), error) {
	return nil, errors.New("cuda: cache locks need flock (a unix system)")
}
