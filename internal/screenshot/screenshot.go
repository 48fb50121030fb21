// Package screenshot renders an HTML page to a PNG with a headless
// Chromium (chromedp): docs/telemetry.md's pictures of the telemetry (a trace's
// waterfall, the dashboard) are pages the tests render from real data and
// shoot with it.
package screenshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/chromedp/chromedp"
)

// EnvChromium names a Chromium (or Chrome) binary to use instead of the
// one found on the machine.
const EnvChromium = "RELAYBUS_CHROMIUM"

// Chromium returns the path of a Chromium or Chrome: RELAYBUS_CHROMIUM,
// else Debian's /usr/bin/chromium, else the first of chromium,
// chromium-browser, google-chrome, google-chrome-stable on PATH.
func Chromium() (string, error) {
	if p := os.Getenv(EnvChromium); p != "" {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium", nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("screenshot: no Chromium: apt-get install chromium, or set " + EnvChromium)
}

// Options say how a page is shot.
type Options struct {
	// Width is the viewport's width in CSS pixels (default 1400); the
	// picture is as tall as the page.
	Width int
	// Timeout bounds the whole shot, Chromium's start included (default
	// 60 s).
	Timeout time.Duration
}

// PNG renders page (a whole HTML document, with no resource outside it)
// in a fresh headless Chromium and returns a full-page screenshot.
func PNG(ctx context.Context, page []byte, o Options) ([]byte, error) {
	if o.Width <= 0 {
		o.Width = 1400
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	bin, err := Chromium()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "relaybus-screenshot-")
	if err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	defer func() {
		// Chromium's helpers may still write in the profile as it exits.
		for range 20 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	file := filepath.Join(dir, "page.html")
	if err := os.WriteFile(file, page, 0o600); err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		// Without these Chromium stalls on a closed network, reaching for
		// Google's services.
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		// /dev/shm is 64 MB in a container (Cloud Build's steps, Docker's
		// default): Chromium's renderer crashes or hangs on a larger page
		// there; this makes it use /tmp instead.
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(filepath.Join(dir, "profile")), chromedp.WindowSize(o.Width, 800),
	)
	defer cancelAlloc()
	// chromedp's protocol tables predate some of Chromium's events and it
	// logs them as unhandled; they say nothing about the page, and a failed
	// action is returned by Run.
	tctx, cancelTab := chromedp.NewContext(actx, chromedp.WithErrorf(func(string, ...any) {}))
	defer cancelTab()
	var png []byte
	if err := chromedp.Run(tctx,
		chromedp.EmulateViewport(int64(o.Width), 800),
		chromedp.Navigate("file://"+file),
		chromedp.WaitReady("body", chromedp.ByQuery),
		chromedp.FullScreenshot(&png, 100),
	); err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	_ = chromedp.Cancel(tctx) // closes the browser and waits for it
	return png, nil
}
