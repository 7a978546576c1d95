// Starts JupyterLab in the page that voyager_lab serves at /lab, with the
// extension modules that build/entry.js (generated from package.json)
// passes. Plugins the page config disables (jupyterlab_server's
// disabledExtensions, from labconfig/page_config.json) are left out, as
// JupyterLab's own application does.
import { JupyterLab } from '@jupyterlab/application';
import { PageConfig } from '@jupyterlab/coreutils';

// The plugins of one extension module (an ES module's default export or a
// CommonJS module, one plugin or a list) that are not disabled.
function plugins(mod, disabled) {
  const exported = Object.prototype.hasOwnProperty.call(mod, '__esModule') ? mod.default : mod;
  const all = Array.isArray(exported) ? exported : [exported];
  return all.filter(plugin => {
    if (PageConfig.Extension.isDisabled(plugin.id)) {
      disabled.push(plugin.id);
      return false;
    }
    return true;
  });
}

export async function start(extensions, mimeExtensions) {
  const disabled = [];
  const mime = [];
  mimeExtensions.forEach(mod => mime.push(...plugins(mod, disabled)));
  const lab = new JupyterLab({
    mimeExtensions: mime,
    disabled: { matches: disabled, patterns: PageConfig.Extension.disabled.map(p => new RegExp(p)) }
  });
  extensions.forEach(mod => lab.registerPlugins(plugins(mod, disabled)));
  await lab.start({ ignorePlugins: PageConfig.getOption('ignorePlugins') ? JSON.parse(PageConfig.getOption('ignorePlugins')) : [] });
  await lab.restored;
  // Tests and scripts wait on this: the shell is laid out and the plugins
  // that restore the workspace have run.
  document.body.dataset.voyagerLab = 'restored';
}
